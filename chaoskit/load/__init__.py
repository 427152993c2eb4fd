"""Open-loop LLM load generation: schedules, clients, HDR recording from intended send times, goodput."""
