"""network.netem and network.bandwidth: a qdisc on an interface, or netem's queue mode (NFQUEUE helper)."""
