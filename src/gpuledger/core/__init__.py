"""The pure core: the node's join, the fleet's join, the history's arithmetic and the
report's queries."""
