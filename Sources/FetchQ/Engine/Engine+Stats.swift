import CFetchQSupport
import CJansson
import Glibc
import Logging

extension Engine {
    // MARK: - Stats

    /// Counters as a new JSON object (see fq_engine_stats).
    public func stats() -> JSONRef {
        lockEngine()
        defer { unlockEngine() }
        let root = json_object()!
        func put(_ object: UnsafeMutablePointer<json_t>, _ key: String, _ value: Int) {
            json_object_set_new(object, key, json_integer(json_int_t(value)))
        }
        // A carrier (internal) holds a slot, so the scheduler's running count
        // has it, but it is not one of the caller's operations: its callers
        // count as queued until they end (submitted = ended + queued +
        // running), and no callback of its is outstanding.
        func counters(_ object: UnsafeMutablePointer<json_t>, _ c: Machine.Counters, internalRunning: Int) {
            put(object, "submitted", c.submitted)
            put(object, "succeeded", c.succeeded)
            put(object, "failed", c.failed)
            put(object, "cancelled", c.cancelled)
            put(object, "queued", c.queued)
            put(object, "running", c.running - internalRunning)
        }
        counters(root, machine.counters, internalRunning: machine.internalRunning)
        put(root, "undelivered", outstanding.count(nil) - machine.counters.queued
                - (machine.counters.running - machine.internalRunning))
        let perQueue = json_object()!
        for queue in machine.queues where !queue.closed && !queue.removed {
            let q = json_object()!
            counters(q, queue.counters, internalRunning: queue.internalRunning)
            put(q, "max_concurrent", queue.maxConcurrent)
            json_object_set_new(q, "suspended", queue.suspended ? json_true() : json_false())
            json_object_set_new(perQueue, queue.name, q)
        }
        json_object_set_new(root, "queues", perQueue)
        if let cache = httpCache {
            let s = cache.statistics
            let c = json_object()!
            put(c, "entries", s.entries)
            put(c, "bytes", s.bytes)
            put(c, "hits", s.hits)
            put(c, "misses", s.misses)
            put(c, "evictions", s.evictions)
            json_object_set_new(root, "cache", c)
        }
        if fqs_jansson_cache_installed() == 1 {
            let c = json_object()!
            put(c, "bytes", fqs_jansson_cache_granted_bytes())
            put(c, "limit", Int(FQS_JC_PROCESS_MAX_BYTES))
            json_object_set_new(root, "jansson_cache", c)
        }
        return JSONRef(owned: root)!
    }
}
