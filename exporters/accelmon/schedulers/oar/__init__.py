"""accelmon's OAR integration (docs/health.md): the node check OAR's ping checker suspects a node by (`health`)."""
