"""Op times: the op-time models that move a measured op to another batch (measured, linear,
linear-floor, fit), op costs from the trace's shapes (FLOPs and bytes), the roofline on a device
and retargeting a measured trace to another device, and batch scaling of a trace."""
