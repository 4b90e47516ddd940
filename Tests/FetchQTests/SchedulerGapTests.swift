@testable import FetchQ
import Testing

/// Behaviours no test pinned, found by mutation testing of the engine core
/// (docs/reliability.md, the eleventh review).
@Suite struct SchedulerGapTests {
    typealias Machine = SchedulerStateMachine<String, AnyObject>

    func started(_ actions: [Machine.Action]) -> [OpID] {
        actions.compactMap { if case .start(let id, _, _, _) = $0 { return id } else { return nil } }
    }

    func submit(_ m: inout Machine, _ q: QueueID, priority: Priority = .normal, qos: QoS = .default,
                host: String? = nil, now: UInt64 = 0) -> (OpID, [Machine.Action]) {
        var spec = Machine.Spec(queue: q)
        spec.priority = priority
        spec.qos = qos
        spec.host = host
        return try! m.submit(spec, now: now).get()
    }

    /// S03: across queues a higher QoS goes first even against a higher
    /// priority, or a higher level reached by aging (fetchq.h, "aging_ms":
    /// "across queues a higher QoS always goes first").
    @Test(arguments: [false, true])
    func qosBeatsPriorityAndAgingAcrossQueuesForAHost(aged: Bool) {
        var m = Machine(config: .init(agingNanos: aged ? 1_000 : 0, maxPerHost: 1, history: 16))
        let bg = m.addQueue(name: "bg", maxConcurrent: 4)
        let ui = m.addQueue(name: "ui", maxConcurrent: 4)
        let (first, _) = submit(&m, bg, host: "h")
        // Priority very-high (aging off), or normal but waiting 100 aging periods.
        _ = submit(&m, bg, priority: aged ? .normal : .veryHigh, qos: .utility, host: "h", now: 0)
        let (interactive, _) = submit(&m, ui, priority: .veryLow, qos: .userInteractive, host: "h", now: aged ? 100_000 : 0)
        #expect(started(m.finished(first, .succeeded, payload: nil, now: aged ? 100_000 : 0)) == [interactive])
    }
}
