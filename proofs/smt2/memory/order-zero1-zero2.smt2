; placement-logic proof obligation: memory/order-zero1-zero2
; theorem: Memory derivation
; ZeRO-1 ≥ ZeRO-2 for all sizes
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 1: model_state(ZeRO-1) ≥ model_state(ZeRO-2)
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
(assert
 (let ((?x0 (to_real N)))
 (<= 1.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x0 (to_real N)))
(let ((?x1 (/ 1.0 ?x0)))
(let ((?x2 (* (* K psi) ?x1)))
(let (($x0 (>= (+ (* 4.0 psi) ?x2) (+ (+ (* 2.0 psi) (* (* 2.0 psi) ?x1)) ?x2))))
(not $x0))))))
(check-sat)
(exit)
