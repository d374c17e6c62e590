"""The built-in op declarations, one module per operator family (the same names as in
kernels/, references/ and strategies/), each registering its ops when imported.  A family
whose judging needs more than its declarations keeps the rest in modules of its own beside
it (quant: `quant_bounds`, `quant_judge`, `quant_bench`), which register nothing."""
