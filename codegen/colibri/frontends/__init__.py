"""Stage 2, front ends: model files and other inputs -> IR.

``load`` detects a file's format from its content and opens it (and .npy arrays); ``seed``
(the seed articles' flat layout, its directory variant, .npz, seeded toy models),
``container`` (the Colibri ``.clb`` of both versions: its byte format, defined once, which the
writers in :mod:`colibri.emit` use too, and its readers), ``hf`` (safetensors and Hugging Face
configs, one MoE block), ``hf_model`` (a whole Hugging Face causal LM), ``export`` (PyTorch
state_dicts and transformers' block modules) and ``tokenizer`` (``tokenizer.json``).
"""
