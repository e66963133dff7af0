"""Stage 3, quantisation: fp32 IR tensors -> the stored formats the C kernels read.

``formats`` defines each scheme once (fp32, fp16, int8 per output channel, int4 blocks of 32 as
``colibri_block_q4_32``), its numpy dtype and quantiser, and the byte sizes the plan and the
budget use; ``model`` quantises a whole model as `colibri generate` asks (a lone layer's experts
and router, or a transformer's experts, dense matrices and routers).
"""
