import Glibc
import Logging

/// Where an engine's log lines go: a C callback when one is set
/// (fq_engine_set_log_fn), else standard error.
///
/// Sendable: the callback lives in a `Locked` (a pthread mutex).
final class LogSink: Sendable {
    typealias Callback = @Sendable (Logger.Level, String) -> Void
    private let callback = Locked<Callback?>(nil)

    func set(_ c: Callback?) { callback.withLock { $0 = c } }

    func emit(_ level: Logger.Level, _ line: String) {
        if let c = callback.withLock({ $0 }) {
            c(level, line)
        } else {
            // One write(2) per line, so concurrent lines do not interleave.
            var text = Array("fetchq \(level): \(line)\n".utf8)
            _ = write(2, &text, text.count)
        }
    }
}

/// The swift-log handler of an engine's logger: forwards to its sink.
struct EngineLogHandler: LogHandler {
    let sink: LogSink
    var logLevel: Logger.Level
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider? = nil

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var line = event.message.description
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        if !merged.isEmpty {
            line += " " + merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        }
        sink.emit(event.level, line)
    }
}

/// Config "log" / FETCHQ_LOG values.
enum LogLevelName {
    static let names: [(String, Logger.Level?)] = [
        ("off", nil), ("critical", .critical), ("error", .error), ("warning", .warning),
        ("notice", .notice), ("info", .info), ("debug", .debug), ("trace", .trace),
    ]

    /// FETCHQ_LOG when set to a known level name, else "warning".
    static func fromEnvironment() -> String {
        level(fromEnvironment: getenv("FETCHQ_LOG").map { String(cString: $0) })
    }

    /// The level a FETCHQ_LOG value selects (case-insensitive); "warning"
    /// when unset or unknown.
    static func level(fromEnvironment value: String?) -> String {
        guard let value = value?.lowercased(), names.contains(where: { $0.0 == value }) else { return "warning" }
        return value
    }
}
