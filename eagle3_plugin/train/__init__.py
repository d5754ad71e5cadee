"""Training EAGLE-3 drafts: data preparation, training-time test loss, the loop behind ``eagle3 train``."""
