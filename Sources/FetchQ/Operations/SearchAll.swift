import CJansson

/// What a search-all's parent and children share.
///
/// `@unchecked Sendable`: `parent`, `children`, `queries` are written under
/// the engine's lock before any member starts and only read afterwards;
/// `parentEnded`, `failedFast` and `endings` are written under the engine's
/// lock (`endings` before the parent can start, which reads it).
final class SearchAllFamily: @unchecked Sendable {
    let template: SearchTemplate
    let failFast: Bool
    let childEvents: Bool
    var parent: OpID = 0
    /// Children in query order.
    var children: [OpID] = []
    var queries: [OpID: String] = [:]
    var parentEnded = false
    var failedFast = false
    /// How each child ended (`Engine.familyEnded`): a child that ended before
    /// it started (waited too long, cancelled, a failed dependency) passes no
    /// result to the parent, only its outcome.
    var endings: [OpID: (status: FQStatus, message: String?)] = [:]

    init(template: SearchTemplate, failFast: Bool, childEvents: Bool) {
        self.template = template
        self.failFast = failFast
        self.childEvents = childEvents
    }

    /// The parent's body: merges the children's items (first occurrence of
    /// each id wins, in query order), sorts them, and reports every query.
    /// {"items": [...], "count": N, "queries": {"<q>": {"count": n} |
    ///  {"error": "...", "status": fq_status, "http_status": n}}}
    func merge(_ op: Operation) -> JSONRef? {
        let byID = Dictionary(op.dependencies.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        var arrays: [JSONRef] = []
        let report = JSONRef.object()
        var firstFailure: (String, OpID, OperationResult?)? = nil
        for child in children {
            let query = queries[child] ?? ""
            let dep = byID[child]
            let result = dep?.payload
            if dep?.outcome == .succeeded, let value = result?.value, let items = Self.itemsPointer.resolve(in: value) {
                arrays.append(items)
                let entry = JSONRef.object()
                entry.set("count", JSONRef.integer(Int64(items.count)))
                report.set(query, entry)
                continue
            }
            let ending = endings[child]
            let entry = JSONRef.object()
            entry.set("error", JSONRef.string(result?.message ?? ending?.message
                                                  ?? "query \"\(query)\" was cancelled before it started"))
            entry.set("status", JSONRef.integer(Int64((result?.status ?? ending?.status ?? .cancelled).rawValue)))
            if let http = result?.http?.status, http > 0 { entry.set("http_status", JSONRef.integer(Int64(http))) }
            report.set(query, entry)
            if firstFailure == nil && dep?.outcome == .failed { firstFailure = (query, child, result) }
        }
        if failFast, let (query, child, result) = firstFailure {
            let ending = endings[child]
            op.errorStatus = result?.status ?? ending?.status ?? .operation
            op.errorMessage = "search-all: query \"\(query)\" failed: \(result?.message ?? ending?.message ?? "no reason given")"
            return nil
        }
        do {
            var items = try JSONSearch.dedupe(arrays, idPointer: template.id)
            if let sort = template.sort {
                items = try JSONSearch.sortItems(items, by: sort, descending: template.endpoint.descending)
            }
            let value = JSONRef.object()
            value.set("items", items)
            value.set("count", JSONRef.integer(Int64(items.count)))
            value.set("queries", report)
            return value
        } catch {
            op.errorStatus = .parse
            op.errorMessage = "search-all: \(error)"
            return nil
        }
    }

    static let itemsPointer = try! JSONPointer("/items")
}
