import FetchQ
import Glibc
import Synchronization

/// Counts operations and bytes, and (when stderr is a terminal) draws a
/// progress bar at most ten times a second on a thread of its own:
///
///     [########------------]  12/30 ops  1.4 MiB  350.2 KiB/s  1 failed
///
/// The rate is over the last two seconds while running, over the whole run
/// on the final line.
final class Progress: Sendable {
    private struct State {
        var total = 0
        var done = 0
        var failed = 0
        /// Bytes received per operation: the latest progress event, replaced
        /// by the metrics' "bytes" when the operation ends.
        var bytes: [OpID: UInt64] = [:]
        var totalBytes: UInt64 = 0
        var stopped = false
        /// (time, totalBytes) of the draws of the last two seconds, for the rate.
        var samples: [(time: Double, bytes: UInt64)] = []
    }

    private let state = Mutex(State())
    private let console: Console
    private let started = monotonicSeconds()
    /// Draw the bar at all (stderr is a terminal and --no-progress not given).
    let visible: Bool
    private let ticker = Mutex<pthread_t?>(nil)
    private let wakeFDs: (read: Int32, write: Int32)

    init(console: Console, visible: Bool) {
        self.console = console
        self.visible = visible
        wakeFDs = (visible ? makePipe() : nil) ?? (-1, -1)
    }

    func expect(_ n: Int) { state.withLock { $0.total += n } }

    /// A progress event: `received` bytes so far for operation `id`.
    func received(_ id: OpID, _ received: UInt64) {
        state.withLock { s in
            let old = s.bytes[id] ?? 0
            if received > old {
                s.bytes[id] = received
                s.totalBytes += received - old
            }
        }
    }

    /// An operation ended; `bytes` from its metrics when it has them.
    func ended(_ id: OpID, bytes: UInt64?, failed: Bool) {
        state.withLock { s in
            s.done += 1
            if failed { s.failed += 1 }
            if let bytes {
                let old = s.bytes[id] ?? 0
                s.bytes[id] = bytes
                s.totalBytes = s.totalBytes - old + bytes
            }
        }
    }

    func start() {
        guard visible, wakeFDs.read >= 0 else { return }
        let fd = wakeFDs.read
        let thread = startThread { [self] in
            while true {
                var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                if poll(&p, 1, 100) != 0 { return }  // woken to stop (or an error)
                draw(final: false)
            }
        }
        ticker.withLock { $0 = thread }
    }

    /// Stops the ticker and draws the final state with a newline.
    func finish() {
        guard visible else { return }
        if let thread = ticker.withLock({ t -> pthread_t? in defer { t = nil }; return t }) {
            var byte: UInt8 = 1
            _ = write(wakeFDs.write, &byte, 1)
            pthread_join(thread, nil)
        }
        draw(final: true)
    }

    private func draw(final: Bool) {
        let now = monotonicSeconds()
        let s = state.withLock { s -> State? in
            if s.stopped { return nil }
            if final { s.stopped = true }
            s.samples.append((now, s.totalBytes))
            s.samples.removeAll { $0.time < now - 2 }
            return s
        }
        guard let s else { return }
        // While running: the rate over the last two seconds; at the end: over the whole run.
        // A run younger than two seconds counts from its start (0 bytes then), not
        // from its first draw: the bytes received before that draw were left out, and
        // a burst in the first tenth of a second showed as 0 B/s until the end.
        let window = started >= now - 2 ? (started, UInt64(0))
                                        : s.samples.first.map { ($0.time, $0.bytes) } ?? (started, 0)
        let since = final ? (started, UInt64(0)) : window
        let rate = now - since.0 > 0.05 ? max(0, Double(s.totalBytes) - Double(since.1)) / (now - since.0)
                                        : Double(s.totalBytes) / max(now - started, 0.001)
        let width = 20
        let filled = s.total > 0 ? min(width, s.done * width / s.total) : 0
        var text = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled) + "]"
        text += "  \(s.done)/\(s.total) ops  \(Self.size(s.totalBytes))  \(Self.size(UInt64(rate)))/s"
        if s.failed > 0 { text += "  \(s.failed) failed" }
        console.bar(text, final: final)
    }

    /// 512 B, 12.3 KiB, 4.0 MiB, 1.2 GiB.
    static func size(_ bytes: UInt64) -> String {
        if bytes < 1024 { return "\(bytes) B" }
        var value = Double(bytes) / 1024
        for unit in ["KiB", "MiB", "GiB"] {
            if value < 1024 || unit == "GiB" {
                let tenths = Int((value * 10).rounded())
                return "\(tenths / 10).\(tenths % 10) \(unit)"
            }
            value /= 1024
        }
        return "\(bytes) B"
    }
}
