; placement-logic proof obligation: claims/zero-abstract-3
; theorem: Claims: zero-abstract.place
; at 1.5x communication cost (ring bytes): holds ⇔ always (undefined where dp = 1: a ratio's divisor is 0)
;   ∀ dp ∈ ℤ, dp ≥ 1: (comm(zero3) / comm(dp) == 3 / 2) ⇔ always (undefined where dp = 1: a ratio's divisor is 0)
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun dp () Int)
(assert
 (let ((?x0 (to_real dp)))
 (<= 1.0 ?x0)))
(assert
 (let ((?x1 (+ (- 2.0) (* 2.0 (to_real dp)))))
 (and (distinct ?x1 0.0) true)))
(assert
 (let ((?x2 (* (* 3.0 (/ 1.0 (+ (- 2.0) (* 2.0 (to_real dp))))) (+ (- 1.0) (to_real dp)))))
(and (distinct (= (/ 3.0 2.0) ?x2) true) true)))
(check-sat)
(exit)
