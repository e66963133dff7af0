"""Stage 4, the numpy reference (the oracle) and the analysis built on it.

``moe`` is the float reference of one MoE block (fp32 router in the C order, so expert choices
match bit for bit); ``kernels`` mirrors the quantised C kernels exactly (integer paths
bit-exact); ``transformer`` runs a whole decoder with a KV cache and sampling; ``accuracy`` is
the generator's analysis stage (routing heat and the accuracy report on calibration tokens) and
the PyTorch check of exported blocks; ``calibration`` runs the fp32 model over --calib and
collects what each expert sees (for the quantisation stage); ``lm_metrics`` scores a language
model's logits (next-token top-1 agreement, perplexity, held-out windows of a token stream).
"""
