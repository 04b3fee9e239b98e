; placement-logic proof obligation: memory/order-dp-zero1
; theorem: Memory derivation
; DP ≥ ZeRO-1 for all sizes
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 1: model_state(DP) ≥ model_state(ZeRO-1)
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
 (let (($x0 (>= (+ (* 4.0 psi) (* K psi)) (+ (* 4.0 psi) (* (* K psi) (/ 1.0 (to_real N)))))))
(not $x0)))
(check-sat)
(exit)
