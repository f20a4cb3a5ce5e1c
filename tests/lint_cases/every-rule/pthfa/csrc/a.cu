__global__ void k() {}
// edited
