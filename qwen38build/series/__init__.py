"""The patch series: the patch-file model, GNU patch, lineage, knobs, upstream evidence, table."""
