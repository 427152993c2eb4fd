"""network.drop and network.partition: nftables rules in a dedicated table of the target namespace."""
