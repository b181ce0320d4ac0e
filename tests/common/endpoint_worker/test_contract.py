"""The worker API's paths (common/endpoint_worker/contract.py): one per report, any request id made safe for a path."""

import pytest

from common.endpoint_worker import contract


def test_each_report_has_its_path_and_ids_are_quoted_into_one_segment():
    assert contract.request_path("r1", contract.RESULT) == "/v1/requests/r1/result"
    assert contract.request_path("a/b?c", contract.PARTIAL) == "/v1/requests/a%2Fb%3Fc/partial"


@pytest.mark.parametrize(("request_id", "report"), [("", contract.RESULT), ("r1", "delete")])
def test_an_empty_id_or_an_unknown_report_is_refused(request_id, report):
    with pytest.raises(ValueError):
        contract.request_path(request_id, report)
