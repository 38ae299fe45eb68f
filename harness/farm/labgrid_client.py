"""A labgrid coordinator seen from the harness: labgrid's own ClientSession (its gRPC stream, its view of places and
resources, kept current by the coordinator's updates) on an event loop of its own thread, with blocking calls for
the requests the farm makes (reserve, poll, acquire, release, tag, comment). Every call has a time limit, and
gRPC's errors become FarmError naming the coordinator and the place."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Coroutine, TypeVar

from harness.errors import FarmError

CALL_TIMEOUT_S = 20.0
CONNECT_TIMEOUT_S = 10.0
DEFAULT_PORT = 20408  # labgrid's
T = TypeVar("T")

# labgrid-client's keepalive settings (labgrid.remote.client.ClientSession)
CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 7500), ("grpc.keepalive_timeout_ms", 10000),
                   ("grpc.http2.ping_timeout_ms", 10000), ("grpc.http2.max_pings_without_data", 0)]
# labgrid.remote.common.ReservationState, by value
WAITING, ALLOCATED, ACQUIRED, EXPIRED, INVALID = range(5)


@dataclass(frozen=True)
class PlaceView:
    """A place as the coordinator last described it: its tags, comment, holder (`host/user` or None), the
    reservation it is allocated to, and the params of each resource it matches, by resource class."""

    name: str
    tags: dict[str, str]
    comment: str
    acquired: str | None
    reservation: str | None
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReservationView:
    """A reservation: its token, state (WAITING .. INVALID), owner and the place allocated to it (or None)."""

    token: str
    state: int
    owner: str
    place: str | None
    created: float


class _CoordinatorGone(logging.Filter):
    """Drops labgrid's own log lines about an unavailable coordinator: the harness's FarmError says it, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not ("labgrid" in record.pathname and "coordinator" in str(record.msg) and
                    ("unavailable" in str(record.msg) or "message pump" in str(record.msg)))


logging.getLogger().addFilter(_CoordinatorGone())


def coordinator_address(url: str) -> str:
    """Return HOST:PORT of a coordinator given as labgrid://HOST[:PORT], grpc://HOST[:PORT] or HOST[:PORT]."""
    text = url.strip()
    for scheme in ("labgrid://", "grpc://"):
        if text.startswith(scheme):
            text = text[len(scheme):]
    text = text.rstrip("/")
    if not text or "/" in text:
        raise FarmError(f"labgrid coordinator {url!r}: expected labgrid://HOST[:PORT] (e.g. labgrid://10.0.0.5:20408)")
    host, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if port and not port.isdigit():
        raise FarmError(f"labgrid coordinator {url!r}: the port {port!r} is not a number")
    return f"{host}:{port}" if port else f"{text}:{DEFAULT_PORT}"


def client_name() -> str:
    """Return the name the coordinator knows this client by: `host/user`, as labgrid-client (LG_HOSTNAME and
    LG_USERNAME override both parts)."""
    import getpass
    import socket

    return f"{os.environ.get('LG_HOSTNAME') or socket.gethostname()}/{os.environ.get('LG_USERNAME') or getpass.getuser()}"


class Coordinator:
    """A connection to a labgrid coordinator (labgrid's ClientSession, subscribed to places and resources)."""

    def __init__(self, url: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.address = coordinator_address(url)
        self.name = client_name()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="labgrid-coordinator", daemon=True)
        self._thread.start()
        self._session: Any = None
        try:
            self._session = self._run(self._start(), connect_timeout_s, "connecting")
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self) -> Any:
        import grpc
        from labgrid.remote.client import ClientSession
        from labgrid.remote.generated.labgrid_coordinator_pb2_grpc import CoordinatorStub

        session = ClientSession(self.address, self._loop)
        # A channel of its own: gRPC shares one connection among a process's channels to one address, and the
        # coordinator knows a client by its connection (a second client of this process would be refused).
        await session.channel.close()
        session.channel = grpc.aio.insecure_channel(self.address, options=[*CHANNEL_OPTIONS,
                                                                            ("grpc.use_local_subchannel_pool", 1)])
        session.stub = CoordinatorStub(session.channel)
        await session.start()
        return session

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float, what: str, place: str | None = None) -> T:
        """Return coro's result, run on the session's loop; FarmError when the coordinator refuses or is silent."""
        import grpc

        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        where = f"labgrid coordinator {self.address}" + (f", place {place}" if place else "")
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise FarmError(f"{where} does not answer ({what} took more than {timeout_s:g} s): is "
                            "labgrid-coordinator running there?") from None
        except grpc.aio.AioRpcError as e:
            raise FarmError(f"{where}: {what} refused: {e.details()}") from None
        except Exception as e:  # labgrid's ServerError on a failed start, and the like
            if type(e).__module__.startswith(("labgrid", "grpc")):
                if what == "connecting":
                    raise FarmError(f"{where} does not answer: is labgrid-coordinator running there? ({e})") from None
                raise FarmError(f"{where}: {what} failed: {e}") from None
            raise

    def _stub_call(self, method: str, request: Any, what: str, place: str | None = None) -> Any:
        stub = getattr(self._session.stub, method)

        async def call() -> Any:
            return await stub(request)

        return self._run(call(), CALL_TIMEOUT_S, what, place)

    def _pb2(self) -> Any:
        from labgrid.remote.generated import labgrid_coordinator_pb2

        return labgrid_coordinator_pb2

    def refresh(self) -> None:
        """Wait until the coordinator has sent every update it had for this client (places, resources)."""
        async def sync() -> None:
            if not await self._session.sync_with_coordinator():
                raise FarmError(f"labgrid coordinator {self.address} closed the connection")

        self._run(sync(), CALL_TIMEOUT_S, "syncing")

    def places(self) -> dict[str, PlaceView]:
        """Return every place by name, with the params of the resources it matches (after a refresh)."""
        self.refresh()

        async def snapshot() -> dict[str, PlaceView]:
            resources = [((exporter, group, entry.cls, name), entry.params)
                         for exporter, groups in self._session.resources.items()
                         for group, entries in groups.items() for name, entry in entries.items() if entry.data]
            views = {}
            for name, place in self._session.places.items():
                matched = {path[2]: dict(params) for path, params in resources if place.hasmatch(path)}
                views[name] = PlaceView(name, dict(place.tags), place.comment or "", place.acquired or None,
                                        place.reservation or None, matched)
            return views

        return self._run(snapshot(), CALL_TIMEOUT_S, "reading places")

    def reserve(self, tags: dict[str, str], prio: float = 0.0) -> ReservationView:
        """Return a new reservation for one place whose tags include `tags` (served by priority, then age)."""
        pb2 = self._pb2()
        request = pb2.CreateReservationRequest(filters={"main": pb2.Reservation.Filter(filter=tags)}, prio=prio)
        return _reservation(self._stub_call("CreateReservation", request, f"reserving {_tags_text(tags)}").reservation)

    def poll(self, token: str) -> ReservationView:
        """Return the reservation's current state, keeping it alive (one not polled for 60 s expires)."""
        response = self._stub_call("PollReservation", self._pb2().PollReservationRequest(token=token),
                                   f"polling reservation {token}")
        return _reservation(response.reservation)

    def reservations(self) -> list[ReservationView]:
        """Return every reservation the coordinator holds."""
        response = self._stub_call("GetReservations", self._pb2().GetReservationsRequest(), "listing reservations")
        return [_reservation(r) for r in response.reservations]

    def cancel(self, token: str) -> None:
        """Cancel a reservation (one that is gone already is fine)."""
        try:
            self._stub_call("CancelReservation", self._pb2().CancelReservationRequest(token=token),
                            f"cancelling reservation {token}")
        except FarmError as e:
            if "does not exist" not in str(e):
                raise

    def acquire(self, place: str) -> None:
        """Acquire place for this client (its exporters mark its resources acquired)."""
        self._stub_call("AcquirePlace", self._pb2().AcquirePlaceRequest(placename=place), "acquiring", place)

    def release(self, place: str, from_user: str | None = None) -> None:
        """Release place; with from_user, only if that user holds it (labgrid-client's release-from / --kick)."""
        pb2 = self._pb2()
        request = (pb2.ReleasePlaceRequest(placename=place, fromuser=from_user) if from_user is not None else
                   pb2.ReleasePlaceRequest(placename=place))
        self._stub_call("ReleasePlace", request, "releasing", place)

    def set_tags(self, place: str, tags: dict[str, str]) -> None:
        """Set tags of place (an empty value deletes that tag)."""
        self._stub_call("SetPlaceTags", self._pb2().SetPlaceTagsRequest(placename=place, tags=tags),
                        "setting tags", place)

    def set_comment(self, place: str, comment: str) -> None:
        """Set the comment of place."""
        self._stub_call("SetPlaceComment", self._pb2().SetPlaceCommentRequest(placename=place, comment=comment),
                        "setting the comment", place)

    def close(self) -> None:
        """Close the stream and the channel, and stop the loop's thread."""
        session, self._session = self._session, None
        if session is not None:
            async def stop() -> None:
                await session.stop()
                await session.close()

            try:
                self._run(stop(), 5.0, "closing")
            except FarmError:
                pass
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reservation(pb: Any) -> ReservationView:
    """Return the view of a labgrid Reservation message (allocations: filter group "main" -> place name)."""
    return ReservationView(pb.token, int(pb.state), pb.owner, pb.allocations.get("main") or None, pb.created)


def _tags_text(tags: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(tags.items()))
