"""Apache Beam pipelines (Kafka -> constrained-MDP transitions, feature aggregates) and the training pipeline.

Installed as ``recsys_rl.pipelines``. ``build_transitions`` runs ``recsys-rl build-transitions`` end to
end over ``kafka_source`` (the bounded replay), ``event_validation``, ``episodes``, ``transitions``,
``feature_aggregates``, ``transition_io``, ``whole_files`` and ``dataset`` (staging, accounting and
publish); ``training_pipeline`` chains ingest, features, train, evaluate, register and promote
(``recsys-rl pipeline run``), and ``pipeline_runs`` reads its run records (``pipeline list|status``).
"""
