"""The warm server's side of its protocol with the host (see pool_server.py): messages framed as the harness
frames its own (8-byte big-endian length + JSON header) followed by raw payloads, and the buffers that hold a
run's stdin and output without leaving a copy in the server's memory. Runs inside the sandbox; Python stdlib
only, never imports vt."""
import mmap
import os

MAX_REQUEST = 1 << 30


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send(harness, fd, header, *payloads):
    """The header framed as the harness frames its messages (8-byte length + JSON), then raw payloads."""
    harness.send(fd, header)
    for p in payloads:
        write_all(fd, p)


def copy_stdin(src, n):
    """A run's stdin (n bytes on the request pipe) -> a fresh anonymous memfd, through a buffer that is
    unmapped afterwards. A run's stdin may hold a program test's code and nonce, which the solution's
    process must never see: no copy of it may stay in this process's memory, which the next run's
    children inherit."""
    if not 0 <= n <= MAX_REQUEST:
        raise ValueError("stdin size out of range")
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    with mmap.mmap(-1, 1 << 16) as buf:
        view = memoryview(buf)
        try:
            while n:
                got = os.readv(src, [view[: min(n, len(buf))]])
                if not got:
                    raise EOFError("request pipe closed mid-request")
                write_all(fd, view[:got])
                n -= got
        finally:
            view.release()
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Output:
    """A run's stdout (up to cap + 1 bytes) or the tail of its stderr (``keep`` bytes), in an anonymous
    mapping that is unmapped after the reply: one run's output never stays in this process's memory."""

    def __init__(self, cap, keep_tail=False):
        self.cap, self.tail = cap, keep_tail
        self.buf = mmap.mmap(-1, max(1, 2 * cap if keep_tail else cap + 1))
        self.view = memoryview(self.buf)
        self.n = 0

    def read_from(self, fd):
        """Read what is there; 0 at end of file."""
        if self.tail and self.n == len(self.buf):
            self.buf.move(0, self.n - self.cap, self.cap)  # keep the last cap bytes
            self.n = self.cap
        if self.n == len(self.buf):
            return -1  # stdout past its cap: the caller has stopped the run already
        got = os.readv(fd, [self.view[self.n :]])
        self.n += got
        return got

    def full(self):
        return not self.tail and self.n > self.cap

    def data(self):
        return self.view[max(0, self.n - self.cap) : self.n] if self.tail else self.view[: self.n]

    def close(self):
        self.view.release()
        self.buf.close()
