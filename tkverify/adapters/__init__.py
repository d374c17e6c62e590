"""Adapters: other libraries' implementations of the registered ops.

Every module here is imported by `tkverify.registry.load_plugins` after the
specs, and adds implementations to ops that are already declared.  An adapter
imports its library only when an implementation runs or checks its
availability, never at load time, and never imports our `kernels` package.
"""
