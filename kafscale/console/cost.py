"""What the cluster's object-store use costs a month, at the current request rates plus the
bytes stored: pure arithmetic, no I/O.

The default prices are the spec's cost appendix's (S3 us-east-1, "Appendix A: S3 Cost
Estimation"), the same numbers as bench/cost.py (bench/ is not part of the installed package,
so they are repeated here): PUT and LIST $0.005 per 1,000 requests; GET, HEAD and any other
operation $0.0004 per 1,000; DELETE free; storage $0.023 per GB-month. As in bench/cost.py, a
month is 30 days and a GB is 10^9 bytes. `Prices` overrides any of them (the console uses the
defaults; other regions' prices are not settings yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kafscale.console.charts import format_bytes, format_rate

REQUEST_PRICE_PER_1000 = {"put": 0.005, "list": 0.005, "get": 0.0004, "head": 0.0004, "delete": 0.0}
OTHER_REQUEST_PRICE_PER_1000 = 0.0004
STORAGE_PRICE_PER_GB_MONTH = 0.023
MONTH_SECONDS = 30 * 86_400
GB = 10**9


@dataclass(frozen=True)
class Prices:
    """Dollars per 1,000 requests by operation (others: `other_per_1000_requests`) and per
    GB-month stored."""

    per_1000_requests: Mapping[str, float] = field(
        default_factory=lambda: dict(REQUEST_PRICE_PER_1000)
    )
    other_per_1000_requests: float = OTHER_REQUEST_PRICE_PER_1000
    storage_per_gb_month: float = STORAGE_PRICE_PER_GB_MONTH

    def per_request(self, operation: str) -> float:
        price = self.per_1000_requests.get(operation, self.other_per_1000_requests)
        return price / 1000


@dataclass(frozen=True)
class CostRow:
    """A line of the estimate as the overview shows it: what, its rate or size, $/month."""

    name: str
    rate: str
    dollars: float


@dataclass(frozen=True)
class CostEstimate:
    """Dollars a month: requests by operation, and storage; `rows` and `basis` for display."""

    requests: Mapping[str, float]
    storage: float
    rows: tuple[CostRow, ...]
    basis: str

    @property
    def requests_total(self) -> float:
        return sum(self.requests.values())

    @property
    def total(self) -> float:
        return self.requests_total + self.storage


def estimate(
    rates_per_second: Mapping[str, float], stored_bytes: int, prices: Prices | None = None
) -> CostEstimate:
    """A month at these request rates (per second, by operation: ``put``, ``get``, ...) with
    `stored_bytes` kept all month."""
    prices = prices or Prices()
    if stored_bytes < 0 or any(rate < 0 for rate in rates_per_second.values()):
        raise ValueError("request rates and stored bytes cannot be negative")
    requests = {
        operation: rate * MONTH_SECONDS * prices.per_request(operation)
        for operation, rate in rates_per_second.items()
    }
    storage = stored_bytes / GB * prices.storage_per_gb_month
    rows = [
        CostRow(f"{op.upper()} requests", format_rate(rates_per_second[op], "req/s"), dollars)
        for op, dollars in requests.items()
    ]
    rows.append(CostRow("Storage", format_bytes(stored_bytes), storage))
    return CostEstimate(requests, storage, tuple(rows), _basis(prices))


def _basis(prices: Prices) -> str:
    requests = ", ".join(
        f"{op.upper()} ${price:g}" for op, price in prices.per_1000_requests.items()
    )
    return (
        f"Per 1,000 requests: {requests}, others ${prices.other_per_1000_requests:g}; storage "
        f"${prices.storage_per_gb_month:g} per GB-month (10^9 bytes); a 30-day month at the "
        "latest sampled rates."
    )
