import CJansson
import Glibc

/// Option "retry": when and how a network operation is tried again.
struct RetryPolicy: Sendable, Hashable {
    /// Retries after the first attempt (0 = none).
    var max = 0
    /// Backoff before retry n (1-based) is base * 2^(n-1), capped at maxDelay,
    /// times a random factor in [0.5, 1] (jitter); a Retry-After header wins
    /// (still capped at maxDelay).
    var base = 0.5
    var maxDelay = 30.0
    var statuses = RetryPolicy.defaultStatuses
    var onNetwork = true
    var onTimeout = true
    /// Retry methods that are not idempotent (POST, PATCH, ...) too.
    var anyMethod = false

    static let idempotent: Set<String> = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]
    /// Built once and shared (copy-on-write): every network job and every
    /// submit's settings start from it, and building the set each time cost
    /// an allocation and six hashes per request.
    static let defaultStatuses: Set<Int> = [408, 429, 500, 502, 503, 504]

    init() {}

    init(reading r: inout OptionReader) throws(FetchQError) {
        if let n = try r.int("max", in: 0...100) { max = n }
        if let b = try r.number("base", in: 0...3600) { base = b }
        if let d = try r.number("max_delay", in: 0...86_400) { maxDelay = d }
        if let b = try r.bool("any_method") { anyMethod = b }
        if let on = r.value("on") {
            guard on.pointee.type == JSON_ARRAY else { throw r.typeError("on", "an array of statuses, \"network\" and \"timeout\"", on) }
            statuses = []
            onNetwork = false
            onTimeout = false
            for i in 0..<json_array_size(on) {
                let item = json_array_get(on, i)!
                if item.pointee.type == JSON_INTEGER, (100...599).contains(json_integer_value(item)) {
                    statuses.insert(Int(json_integer_value(item)))
                } else if item.pointee.type == JSON_STRING, jsonString(item) == "network" {
                    onNetwork = true
                } else if item.pointee.type == JSON_STRING, jsonString(item) == "timeout" {
                    onTimeout = true
                } else {
                    throw FetchQError(.invalid, "\(r.path("on"))[\(i)]: expected a status 100...599, \"network\" or \"timeout\"")
                }
            }
        }
        try r.finish()
    }

    /// The delay in seconds before the next attempt, or nil to stop.
    /// `attempt` is the number of attempts made so far (>= 1).
    func delay(after outcome: Result<HTTPResponse, TransportError>, attempt: Int, method: String,
               now: Double) -> Double? {
        guard attempt <= max, anyMethod || Self.idempotent.contains(method) else { return nil }
        switch outcome {
        case .success(let response):
            guard statuses.contains(response.status) else { return nil }
            if let after = response.header("retry-after"), let seconds = Self.retryAfter(after, now: now) {
                return min(seconds, maxDelay)
            }
        case .failure(let error):
            switch error.kind {
            case .timeout: guard onTimeout else { return nil }
            case .connect, .resolve, .network: guard onNetwork else { return nil }
            default: return nil
            }
        }
        let exponential = min(maxDelay, base * Double(1 << Swift.min(attempt - 1, 30)))
        return exponential * Double.random(in: 0.5...1.0)
    }

    /// Retry-After: delay-seconds or an HTTP-date (RFC 9110 §10.2.3).
    /// delay-seconds is 1*DIGIT, with no bound: more digits than an Int
    /// holds is a delay longer than any max_delay, not an invalid value.
    static func retryAfter(_ value: String, now: Double) -> Double? {
        let trimmed = value.trimmingCharacters(in: " \t")
        if !trimmed.isEmpty && trimmed.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            return Int(trimmed).map(Double.init) ?? .infinity
        }
        guard let date = HTTPDate.parse(trimmed) else { return nil }
        return Swift.max(0, date - now)
    }
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        let chars = Set(set)
        return String(drop(while: { chars.contains($0) }).reversed().drop(while: { chars.contains($0) }).reversed())
    }
}

/// Wall-clock seconds since the epoch.
func wallClockSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
