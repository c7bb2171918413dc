"""What every draft shares: norms, rotary attention, MLP, decoder layers, a rollback-able KV cache, d2t/t2d maps."""
