; placement-logic proof obligation: memory/zero3-k12
; theorem: Memory derivation
; ZeRO-3 model state = 16Ψ/N with K = 12
;   ∀ Ψ > 0, N ∈ ℤ, N ≥ 1: model_state(ZeRO-3)|K=12 = 16Ψ/N
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (let ((?x8 (to_real N)))
 (<= 1.0 ?x8)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x8 (to_real N)))
 (and (distinct ?x8 0.0) true)))
(assert
 (let ((?x8 (to_real N)))
 (and (distinct ?x8 0.0) true)))
(assert
 (let ((?x8 (to_real N)))
(let ((?x13 (/ 1.0 ?x8)))
(let ((?x16 (* (* 16.0 psi) ?x13)))
(not (= ?x16 ?x16))))))
(check-sat)
(exit)
