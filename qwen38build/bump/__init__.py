"""The bump report: what moving the vLLM pin means for every patch."""
