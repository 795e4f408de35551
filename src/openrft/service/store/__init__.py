"""The durable job store: tables, migrations, and the repository the API and workers share."""

from openrft.service.store.base import Conflict, NotFound
from openrft.service.store.progress import CheckpointRecord
from openrft.service.store.repository import Store

__all__ = ["CheckpointRecord", "Conflict", "NotFound", "Store"]
