"""The target's hidden states: which layers, the resumable run both backends share, the transformers and vLLM
backends (`dataset.extract_dataset` picks), and states computed while training."""
