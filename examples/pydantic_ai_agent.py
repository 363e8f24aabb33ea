"""A small PydanticAI agent, run by runlease as it is (docs/agents.md).

    pip install 'runlease[pydantic-ai]'
    runlease dev --agent examples.pydantic_ai_agent:agent       # a scripted model, offline
    runlease runs submit --input '{"input": "Plan a day in Oslo"}'

Each model request and each tool call is a durable step; `book_table` needs
a person's approval (a deferred tool: the run waits, holding no worker,
until someone answers in the console or with `runlease runs input`). With
OPENAI_API_KEY set (and OPENAI_BASE_URL for another compatible server), a
real model answers.
"""

from __future__ import annotations

from pydantic_ai import Agent

agent = Agent(
    name="day-planner",
    instructions="Plan the user's day: check the weather, then book a table for dinner.",
)


@agent.tool_plain
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"Sunny and 21 C in {city}."


@agent.tool_plain(requires_approval=True)
def book_table(restaurant: str) -> str:
    """Book a table for two at a restaurant (a person approves first)."""
    return f"Booked a table at {restaurant} for 19:00."
