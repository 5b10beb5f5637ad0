"""Learned routing around its model: the feedback loop, persistence, audit reads, metrics and the policy gate.

The model itself (predictor, features, lifecycle, the learned profile, off-policy evaluation) is a
pure routing plugin in ``inferlb/routing/``; here live the parts with I/O: ``loop`` (train, retrain
from the audit trail, save and restore), ``store`` (the ``routing_predictors`` queries), ``audit``
(logged decisions read back), ``metrics`` (Prometheus figures), ``policy_gate`` (a live routing
change judged on the audit trail first) and ``share`` with its adapters ``share_length`` and
``share_reward`` (the latency predictor, the output-length predictor and the reward bandit, one
trainer for a cluster, snapshots for the others).
"""
