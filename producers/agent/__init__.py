"""The node agent: sources that read this node's GPUs, flows and links, and the runner that publishes them.

`clocktower agent --node ID` (clocktower/agent_cli.py) builds the sources this machine supports and runs
them under `AgentRunner`.
"""
