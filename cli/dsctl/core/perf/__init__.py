"""Performance model of chip and model: roofline, the engine's scheduler and the estimate built on them."""
