import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.staging.s3 import S3Url


def test_parse_and_child():
    u = S3Url.parse("s3://bucket/runs/1/")
    assert (u.bucket, u.key) == ("bucket", "runs/1/")
    assert u.child("a/b.bin").key == "runs/1/a/b.bin"
    assert S3Url.parse("s3://bucket").child("x").key == "x"


@pytest.mark.parametrize("bad", ["http://x/y", "s3://", "s3:///key", "s3://b/k\nx"])
def test_bad_urls(bad):
    with pytest.raises(UserInputError):
        S3Url.parse(bad)
