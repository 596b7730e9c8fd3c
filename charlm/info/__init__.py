"""Info: what `charlm info` reports: the parameter table, FLOPs per token and forward shapes.
May import: everything below it (core up to training)."""
