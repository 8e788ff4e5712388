"""The gRPC serving layer (DESIGN 9): Rank and Allocate from blessed registry policies, with decision logs.

Installed as ``recsys_rl.serving``. One job per module: ``settings`` (the server's config),
``request_validation`` (request checks), ``online_state`` (the policy's state vector),
``online_features`` (online features within a budget), ``policies`` (what decides), ``routing`` (which
policy answers whom, hot reload), ``decision_log`` (bounded queue to Kafka), ``wire`` (Rank candidates as
encoded bytes), ``metrics``, ``auth``, ``reflection``, ``service`` (the RPC handlers) and ``server``
(assembly).
"""
