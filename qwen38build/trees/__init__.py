"""Fixed-output source trees: a repository's files at a commit, pinned by a hash of the tree."""
