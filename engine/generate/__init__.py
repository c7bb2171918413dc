"""Generation: baseline and lossless speculative decoding with pluggable proposers, metrics, benchmarks."""
