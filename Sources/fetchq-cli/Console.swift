import FetchQ
import Glibc
import Synchronization

/// Everything the CLI writes: JSON lines on stdout, messages and the
/// progress bar on stderr. One lock orders them, so a message never lands
/// in the middle of the bar and the bar is cleared before it.
final class Console: Sendable {
    private struct State {
        /// The bar is on screen (the cursor is at the end of its line).
        var barShown = false
        /// The errno of the first result that could not be written; 0: none.
        var writeError: Int32 = 0
        var onWriteError: (@Sendable () -> Void)? = nil
    }

    private let state = Mutex(State())
    /// stdout is the same kind of terminal the bar draws on: clear the bar
    /// before writing a result line too.
    private let stdoutIsTTY = isatty(1) == 1

    /// One JSON value as a line on stdout (`JSONRef.lineBytes`: reals in
    /// their shortest form, U+2028 and U+2029 escaped). After a line could
    /// not be written, the others are not tried, and `onWriteError` runs once.
    func result(_ value: JSONRef) {
        // (nil only for a cycle, which no result has: jansson's text then)
        var bytes = value.lineBytes ?? Array(value.dumps().utf8)
        bytes.append(10)
        let failed: (@Sendable () -> Void)? = state.withLock { s in
            guard s.writeError == 0 else { return nil }
            if s.barShown && stdoutIsTTY {
                writeAll(2, Array("\r\u{1B}[K".utf8))
                s.barShown = false
            }
            guard let error = Startup.stdoutWasClosed ? EBADF : writeAll(1, bytes) else { return nil }
            s.writeError = error
            return s.onWriteError
        }
        failed?()
    }

    /// The errno of the first result line that could not be written, or 0.
    var writeError: Int32 { state.withLock { $0.writeError } }

    /// What to do when a result cannot be written (once, on the thread that
    /// tried): the results after it would be lost too.
    func onWriteError(_ action: @escaping @Sendable () -> Void) {
        state.withLock { $0.onWriteError = action }
    }

    /// A message on stderr, prefixed "fetchq: ".
    func error(_ message: String) {
        line("fetchq: \(message)")
    }

    /// A line on stderr (the engine's log lines come here: written by the
    /// engine itself they landed on the bar's line, the tenth review), the
    /// bar cleared first; the next redraw puts it back.
    func line(_ text: String) {
        let bytes = Array("\(text)\n".utf8)
        state.withLock { s in
            if s.barShown {
                writeAll(2, Array("\r\u{1B}[K".utf8))
                s.barShown = false
            }
            writeAll(2, bytes)
        }
    }

    /// Draws (or redraws) the bar; `final` ends its line.
    func bar(_ text: String, final: Bool) {
        let bytes = Array("\r\(text)\u{1B}[K\(final ? "\n" : "")".utf8)
        state.withLock { s in
            writeAll(2, bytes)
            s.barShown = !final
        }
    }
}
