"""asv plugins for the verify-attn benchmarks (loaded via asv.conf.json "plugins")."""
