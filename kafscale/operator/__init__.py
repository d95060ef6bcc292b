"""The Kubernetes operator (docs/design/operator.md): KafscaleCluster, KafscaleTopic and
KafscaleUser resources reconciled into Kubernetes objects and Kafka admin calls.

Pure modules decide (``model``, ``cluster``, ``etcd``, ``status``, ``topics``, ``users``); the I/O
modules carry out what they return (``kube``, ``admin``, ``handlers``).
"""

GROUP = "kafscale.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
FIELD_MANAGER = "kafscale-operator"
