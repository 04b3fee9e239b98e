; placement-logic proof obligation: memory/order-dp-zero1-strict
; theorem: Memory derivation
; DP > ZeRO-1 when N ≥ 2
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: model_state(DP) > model_state(ZeRO-1)
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
 (<= 2.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x1 (* K psi)))
(let ((?x2 (* 4.0 psi)))
(let ((?x3 (+ ?x2 ?x1)))
(not (> ?x3 (+ ?x2 (* ?x1 (/ 1.0 (to_real N))))))))))
(check-sat)
(exit)
