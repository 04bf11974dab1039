"""Which images' encoder outputs the worker holds (vLLM v1's EncoderCacheManager). The scheduler decides in every
step which images the worker encodes and which outputs it drops, so both always agree on what it holds, and the
pixels travel only to the step that encodes them."""
from collections import OrderedDict
from dataclasses import dataclass, field

from sluice.core.images import ImageInput
from sluice.scheduler.request import Request


@dataclass(slots=True)
class ChunkImages:
    """The images whose placeholders a chunk of a request's tokens holds: outputs held, and images to encode."""

    num_tokens: int  # the chunk, cut before the first image whose output is neither held nor fits this step
    reused: list[bytes] = field(default_factory=list)
    to_encode: list[ImageInput] = field(default_factory=list)

    @property
    def num_encoder_tokens(self) -> int:
        return sum(image.length for image in self.to_encode)


class EncoderCache:
    """Holds at most `capacity` placeholder tokens' outputs. A request reads an output from the chunk that first
    holds the image's placeholders until its computed tokens pass them; an output no request reads stays held, for a
    later request with the same image, until room for another image evicts it (least recently read first)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.num_free = capacity
        self._sizes: dict[bytes, int] = {}  # hash -> rows, of every output held (or encoded by a planned step)
        self._readers: dict[bytes, set[str]] = {}
        self._unread: OrderedDict[bytes, None] = OrderedDict()  # held and read by no request, least recent first
        self._num_unread = 0  # their rows
        self._reads: dict[str, set[bytes]] = {}  # request id -> the hashes it reads
        self._encoding: dict[bytes, ImageInput] = {}  # this step's images to encode
        self._evicted: list[bytes] = []  # since the last step was taken, and held by the worker
        self.num_reads = 0  # images that requests began to read
        self.num_hits = 0  # of them, outputs held already
        self.num_deferrals = 0  # chunks cut before an image they could not encode in their step

    @property
    def held_hashes(self) -> set[bytes]:
        return set(self._sizes)

    def plan_chunk(self, request: Request, start: int, num_tokens: int, encoder_budget: int) -> ChunkImages:
        """The images of the request's tokens start..start + num_tokens - 1, cut before the first image that is not
        held and whose encoding exceeds the step's encoder budget or the room the cache can make. Changes nothing
        but the count of chunks it cut."""
        chunk = ChunkImages(num_tokens)
        room = self.num_free + self._num_unread
        planned = set()
        for image in request.images:
            if image.offset >= start + chunk.num_tokens:
                break
            if image.end <= start:
                continue
            if image.hash in planned:  # the same image again
                continue
            if image.hash in self._sizes:
                if image.hash in self._unread:
                    room -= self._sizes[image.hash]
                chunk.reused.append(image.hash)
            elif image.length <= min(encoder_budget, room):
                encoder_budget -= image.length
                room -= image.length
                chunk.to_encode.append(image)
            else:
                chunk.num_tokens = max(image.offset - start, 0)  # a chunk that starts inside it waits whole
                self.num_deferrals += 1
                break
            planned.add(image.hash)
        return chunk

    def take(self, request_id: str, chunk: ChunkImages) -> None:
        """The request reads the chunk's images: held ones stop being evictable, the others are allocated (evicting
        unread outputs as needed) and encoded in this step."""
        for image_hash in chunk.reused:
            if request_id not in self._readers[image_hash]:
                self.num_reads += 1
                self.num_hits += 1
            self._read(request_id, image_hash)
        for image in chunk.to_encode:
            while self.num_free < image.length:
                self._evict(next(iter(self._unread)))
            self.num_free -= image.length
            self._sizes[image.hash] = image.length
            self._readers[image.hash] = set()
            self._encoding[image.hash] = image
            self.num_reads += 1
            self._read(request_id, image.hash)

    def release_passed(self, request: Request) -> None:
        """The request stops reading the images whose placeholders its computed tokens have passed."""
        reads = self._reads.get(request.request_id)
        if reads:
            needed = {image.hash for image in request.images if image.end > request.num_computed_tokens}
            for image_hash in reads - needed:
                self._unread_by(request.request_id, image_hash)

    def release(self, request_id: str) -> None:
        """The request reads none of its images any more (it finished, or was preempted)."""
        for image_hash in list(self._reads.get(request_id, ())):
            self._unread_by(request_id, image_hash)

    def take_step(self) -> tuple[list[bytes], list[ImageInput]]:
        """(the hashes whose outputs the worker drops, the images it encodes) since the last step was taken."""
        evicted, encoding = self._evicted, list(self._encoding.values())
        self._evicted, self._encoding = [], {}
        return evicted, encoding

    def reset(self) -> None:
        """Forgets every output: the worker that held them is gone."""
        self.num_free, self._num_unread = self.capacity, 0
        for held in (self._sizes, self._readers, self._unread, self._reads, self._encoding):
            held.clear()
        self._evicted = []

    def _read(self, request_id: str, image_hash: bytes) -> None:
        self._readers[image_hash].add(request_id)
        if image_hash in self._unread:
            del self._unread[image_hash]
            self._num_unread -= self._sizes[image_hash]
        self._reads.setdefault(request_id, set()).add(image_hash)

    def _unread_by(self, request_id: str, image_hash: bytes) -> None:
        reads = self._reads[request_id]
        reads.discard(image_hash)
        if not reads:
            del self._reads[request_id]
        readers = self._readers[image_hash]
        readers.discard(request_id)
        if not readers:
            self._unread[image_hash] = None
            self._num_unread += self._sizes[image_hash]

    def _evict(self, image_hash: bytes) -> None:
        del self._unread[image_hash]
        del self._readers[image_hash]
        size = self._sizes.pop(image_hash)
        self._num_unread -= size
        self.num_free += size
        if self._encoding.pop(image_hash, None) is None:  # an image planned in this step never reaches the worker
            self._evicted.append(image_hash)
