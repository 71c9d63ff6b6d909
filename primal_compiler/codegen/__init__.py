"""Code generation: KV-cache placement, the IPCN instruction stream and its power schedule."""
