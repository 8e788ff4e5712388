"""The gRPC serving layer (DESIGN 9): Rank and Allocate from blessed registry policies, with decision logs.

One job per module: ``config`` (settings), ``validation`` (request checks), ``state`` (the policy's
state vector), ``features`` (online features within a budget), ``policies`` (what decides),
``routing`` (which policy answers whom, hot reload), ``decision_log`` (bounded queue to Kafka),
``metrics``, ``auth``, ``reflection``, ``service`` (the RPC handlers) and ``server`` (assembly).
"""
