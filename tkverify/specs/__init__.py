"""The built-in op declarations, one module per operator family (the same names as in
kernels/, references/ and strategies/)."""
