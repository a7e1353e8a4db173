"""Routes of retention rules (:mod:`outbox.retention_rules`): how long the
payloads of an endpoint's, or an event type's, delivered messages are kept.
The operator's alone, as event types' settings are."""

from __future__ import annotations

from typing import Any

from dispatchers.api.calls import Call, Route, library_errors, not_found
from dispatchers.api.requests import RetentionRuleQuery, RetentionRuleSet
from dispatchers.api.responses import RetentionRuleDeleted, RetentionRuleList, RetentionRuleOut
from dispatchers.api.store import Conn, audit
from outbox.retention_rules import RetentionRule, RetentionRules

TAG = "retention"


def _shown(rule: RetentionRule) -> RetentionRuleOut:
    return RetentionRuleOut(**rule.as_dict())


def _subject(endpoint_id: int | None, event_type: str | None) -> str:
    return f"endpoint:{endpoint_id}" if endpoint_id is not None else f"event_type:{event_type}"


def _dump(rule: RetentionRule | None) -> dict[str, Any] | None:
    return None if rule is None else _shown(rule).model_dump(mode="json")


async def list_retention_rules(call: Call) -> RetentionRuleList:
    found = await call.read(RetentionRules(schema=call.schema).all)
    return RetentionRuleList(items=[_shown(r) for r in found])


async def set_retention_rule(call: Call) -> RetentionRuleOut:
    body = call.body(RetentionRuleSet)
    rules = RetentionRules(schema=call.schema)

    def work(conn: Conn) -> RetentionRuleOut:
        with library_errors(payload_retention="body.payload_retention_s"):
            before = rules.get(conn, endpoint_id=body.endpoint_id, event_type=body.event_type)
            rule = rules.set(
                conn,
                payload_retention=body.payload_retention_s,
                endpoint_id=body.endpoint_id,
                event_type=body.event_type,
            )
        audit(
            conn,
            call.schema,
            call.who,
            "set",
            "retention_rule",
            _subject(rule.endpoint_id, rule.event_type),
            before=_dump(before),
            after=_dump(rule),
        )
        return _shown(rule)

    return await call.write(work)


async def delete_retention_rule(call: Call) -> RetentionRuleDeleted:
    query = call.query(RetentionRuleQuery)
    rules = RetentionRules(schema=call.schema)

    def work(conn: Conn) -> RetentionRuleDeleted:
        with library_errors("query"):
            before = rules.get(conn, endpoint_id=query.endpoint_id, event_type=query.event_type)
        if before is None:
            raise not_found("retention rule of", _subject(query.endpoint_id, query.event_type))
        rules.delete(conn, endpoint_id=query.endpoint_id, event_type=query.event_type)
        audit(
            conn,
            call.schema,
            call.who,
            "delete",
            "retention_rule",
            _subject(query.endpoint_id, query.event_type),
            before=_dump(before),
        )
        return RetentionRuleDeleted(endpoint_id=query.endpoint_id, event_type=query.event_type)

    return await call.write(work)


ROUTES = [
    Route("GET", "/retention-rules", list_retention_rules, RetentionRuleList,
          "List the retention rules of payloads", TAG, operator_only=True),
    Route("PUT", "/retention-rules", set_retention_rule, RetentionRuleOut,
          "Keep an endpoint's or event type's payloads for less than the history", TAG,
          body_model=RetentionRuleSet, operator_only=True),
    Route("DELETE", "/retention-rules", delete_retention_rule, RetentionRuleDeleted,
          "Drop the retention rule of an endpoint or event type", TAG,
          query_model=RetentionRuleQuery, operator_only=True),
]  # fmt: skip
