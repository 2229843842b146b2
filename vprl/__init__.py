"""vprl: reinforcement learning for visual program generators (docs/architecture.md)."""
