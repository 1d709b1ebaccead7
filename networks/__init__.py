"""IMPALA agent networks (Sonnet 2).

Typical use::

    agent = networks.make_agent("ResNetLSTMAgent", num_actions=6)
    networks.build_variables(agent, (84, 84, 4), tf.uint8)  # variables exist from here on
    output, state = agent(step_inputs, agent.initial_state(batch_size))   # [B, ...]
    outputs, final_state = agent.unroll(trajectory_inputs, initial_state)  # [T, B, ...]
"""

from networks.agents import (
    AGENTS,
    LOW_PRECISION_AGENTS,
    FeedForwardAgent,
    LSTMAgent,
    MLPAgent,
    ResettingCore,
    ResNetAgent,
    ResNetLSTMAgent,
    ShallowConvNetAgent,
    ShallowConvNetLastActionAgent,
    ShallowLSTMAgent,
    SimpleConvNetAgent,
    make_agent,
)
from networks.base import (
    Agent,
    AgentInput,
    AgentOutput,
    AgentState,
    build_variables,
    dummy_inputs,
    make_input,
)
from networks.torsos import COMPUTE_DTYPES

__all__ = [
    "AGENTS",
    "COMPUTE_DTYPES",
    "LOW_PRECISION_AGENTS",
    "Agent",
    "AgentInput",
    "AgentOutput",
    "AgentState",
    "FeedForwardAgent",
    "LSTMAgent",
    "MLPAgent",
    "ResNetAgent",
    "ResNetLSTMAgent",
    "ResettingCore",
    "ShallowConvNetAgent",
    "ShallowConvNetLastActionAgent",
    "ShallowLSTMAgent",
    "SimpleConvNetAgent",
    "build_variables",
    "dummy_inputs",
    "make_agent",
    "make_input",
]
