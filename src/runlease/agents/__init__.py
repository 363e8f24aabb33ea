"""Built-in agents: `runlease.agents.script:agent` and `runlease.agents.openai:agent`."""
