"""The one reply-timeout path both transports' ``receive`` use
(``jaxmesh.remote.client.next_reply``), against hand-written expectations."""

import queue
import threading

import pytest

from jaxmesh.errors import RemoteConnectionError
from jaxmesh.remote.client import next_reply


def test_a_reply_a_reader_thread_hands_over_is_returned():
    replies = queue.Queue()
    reader = threading.Thread(target=replies.put, args=((0.0, "reply"),))
    reader.start()
    hung = []
    assert next_reply(replies, 10.0, "127.0.0.1:1", lambda: hung.append(1)) == "reply"
    reader.join()
    assert hung == []


def test_no_reply_in_time_marks_the_session_and_says_so():
    hung = []
    with pytest.raises(RemoteConnectionError) as info:
        next_reply(queue.Queue(), 0.05, "127.0.0.1:1", lambda: hung.append(1))
    assert str(info.value) == (
        "no reply from the jaxmesh env server at 127.0.0.1:1 within 0.05 s "
        "(reply_timeout); the env may hang"
    )
    assert info.value.code == "DEADLINE_EXCEEDED"
    assert info.value.address == "127.0.0.1:1"
    assert info.value.__suppress_context__
    assert hung == [1]


def test_an_error_the_reader_handed_over_fails_every_later_call():
    replies = queue.Queue()
    error = RemoteConnectionError("stream ended", address="127.0.0.1:1")
    replies.put((None, error))
    for _ in range(2):
        with pytest.raises(RemoteConnectionError) as info:
            next_reply(replies, 0.05, "127.0.0.1:1", lambda: None)
        assert info.value is error
