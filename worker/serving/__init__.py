"""Serving jobs on a node: the listening socket a serving trainer answers on, and the relay of chat
completion requests from the api (over the bus) to that socket."""
