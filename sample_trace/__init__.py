"""Sample traces produced by triosim's own tracer (see README.md here); shipped in the wheel."""
