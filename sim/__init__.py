"""ADC's trace-driven cluster simulator: real traces replayed through the live decider's own code."""
