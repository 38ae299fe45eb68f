"""Task accuracy on labelled data (a model spec's `evaluation:` section): the section (spec), labelled samples
(datasets), post-processing, metrics, and the comparison of quantized with float (task)."""
