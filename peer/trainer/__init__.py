"""The sitemesh trainer: Qwen3 (transformers) on blocks of packed text, DiLoCo inner loop, evaluation.

It knows nothing of the mesh: it is handed global weights and sample ranges of data blocks, and
returns a pseudo-gradient and token counts. The outer step lives in `peer/outer.py`.
See docs/trainer.md.
"""
