/// Identical in-flight GETs share one transfer: an engine-internal carrier
/// operation runs it (in the first caller's queue, at the highest priority
/// among the callers) and every caller gets its own result from the one
/// response. A caller that cancels is detached; the transfer is cancelled
/// only when no caller is left.
///
/// `@unchecked Sendable`: every field is guarded by the engine's lock.
final class SharedTransfer: @unchecked Sendable {
    let key: String
    var carrier: OpID = 0
    var callers: [Operation] = []
    var priority: Priority
    /// The carrier ended: no more callers may attach.
    var done = false

    init(key: String, priority: Priority) {
        self.key = key
        self.priority = priority
    }
}
